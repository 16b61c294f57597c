"""Tests for helpers.judge: score parsing, a fake OpenAI-compatible endpoint on 127.0.0.1, the tiny model as judge."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import rewards as R
from helpers.judge import (
    GroupJudge,
    JudgeReply,
    JudgeReward,
    OpenAIBackend,
    TransformersBackend,
    parse_sample_scores,
    parse_score,
    parse_verdict,
)
from tests.test_rewards import CALL, make_traj


@pytest.mark.parametrize(
    "reply, score",
    [("Score: 7", 7), ("The steps are fine.\n**Score:** 8", 8), ("I'd give it 9/10.", 9), ("6 out of 10", 6), ("  4 ", 4),
     ("score = 2.5", 2.5), ("Score: 42", None), ("The agent did step 3 of 5 wrong.", None), ("", None), ("great job!", None)],
)
def test_parse_score(reply, score):
    assert parse_score(reply) == score


def test_parse_verdict():
    assert parse_verdict("Looks right. PASS") is True
    assert parse_verdict("FAIL: no tool call") is False
    assert parse_verdict("passable") is None


# --- a fake OpenAI-compatible endpoint --------------------------------------------------------


class FakeEndpoint:
    """``POST /v1/chat/completions`` on 127.0.0.1 answering with ``reply_fn(prompt_text)``; counts requests.

    A reply that is not a string is sent as the whole JSON body (for replies of odd shapes)."""

    def __init__(self, reply_fn, delay: float = 0.0):
        endpoint = self
        self.requests: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(body)
                time.sleep(delay)
                text = reply_fn(body["messages"][-1]["content"])
                out = text if not isinstance(text, str) else {  # not a string: the whole JSON body, as given
                    "choices": [{"message": {"role": "assistant", "content": text}}], "usage": {"prompt_tokens": 100, "completion_tokens": 5}}
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep pytest output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint_factory():
    servers = []

    def make(reply_fn, delay=0.0):
        servers.append(FakeEndpoint(reply_fn, delay))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_http_judge_scores_caches_and_reports_cost(endpoint_factory):
    # the fake judge likes transcripts with a tool call: 9, otherwise 3
    ep = endpoint_factory(lambda prompt: "Score: 9" if "tool_call" in prompt else "Reasoning...\nScore: 3")
    judge = JudgeReward(OpenAIBackend(ep.url, model="fake-judge", api_key="sk-test"))
    with_tool = make_traj([CALL, ("tool", "1000"), "<answer>1000</answer>"])
    without = make_traj(["<answer>1000</answer>"], group=1)
    assert judge(with_tool) == pytest.approx((9 - 1) / 9)
    assert judge(without) == pytest.approx((3 - 1) / 9)
    assert judge(make_traj(["<answer>1000</answer>"], group=2)) == pytest.approx(2 / 9)  # same content: cached
    assert len(ep.requests) == 2 and judge.stats.cache_hits == 1
    assert judge.stats.prompt_tokens == 200 and judge.stats.completion_tokens == 10
    assert ep.requests[0]["model"] == "fake-judge" and "Reference answer: 1000" in ep.requests[0]["messages"][-1]["content"]
    assert "2 calls, 1 cache hits, 200 prompt + 10 completion tokens" in judge.cost()


def test_judge_reply_with_no_score_is_a_recorded_parse_failure(endpoint_factory):
    ep = endpoint_factory(lambda prompt: "This trajectory looks reasonable to me.")
    judge = JudgeReward(OpenAIBackend(ep.url, model="m"))
    assert judge(make_traj(["<answer>1000</answer>"])) == 0.0
    assert judge.stats.parse_failures == 1
    assert judge.failures[0]["kind"] == "parse" and "looks reasonable" in judge.failures[0]["reply"]


def test_judge_timeout_is_recorded_not_raised(endpoint_factory):
    ep = endpoint_factory(lambda prompt: "Score: 10", delay=1.0)
    judge = JudgeReward(OpenAIBackend(ep.url, model="m", timeout=0.2))
    assert judge(make_traj(["<answer>1000</answer>"])) == 0.0
    assert judge.stats.errors == 1 and judge.failures[0]["kind"] == "TimeoutError"
    assert judge.cache == {}  # a timeout is not cached: the next call may succeed


def test_judge_pass_fail_mode_and_prepare_in_parallel(endpoint_factory):
    ep = endpoint_factory(lambda prompt: "PASS" if "<answer>1000</answer>" in prompt else "FAIL")
    judge = JudgeReward(OpenAIBackend(ep.url, model="m"), rubric="Is the final answer tagged and right?", mode="pass")
    trajs = [make_traj([f"<answer>{n}</answer>"], group=i) for i, n in enumerate([1000, 7, 1000, 9])]
    judge.prepare(trajs)
    assert len(ep.requests) == 3  # two trajectories share one cache entry
    assert [judge(t) for t in trajs] == [1.0, 0.0, 1.0, 0.0]
    assert judge.stats.cache_hits == 1  # only the duplicate saved a call; reading prepare's results is not a hit
    with pytest.raises(ValueError, match="mode must be"):
        JudgeReward(None, mode="stars")


def test_group_judge_one_request_per_task(endpoint_factory):
    def reply(prompt):  # rank samples: the one with a tool call best, a missing line for sample 3
        lines = []
        for i, block in enumerate(prompt.split("=== Sample ")[1:], start=1):
            if i != 3:
                lines.append(f"Sample {i}: {9 if 'tool_call' in block else 4}")
        return "\n".join(lines)

    ep = endpoint_factory(reply)
    judge = GroupJudge(OpenAIBackend(ep.url, model="m"))
    trajs = [make_traj([CALL, ("tool", "1000"), "<answer>1000</answer>"], task_id="a", group=0),
             make_traj(["<answer>1000</answer>"], task_id="a", group=1),
             make_traj(["<answer>1001</answer>"], task_id="a", group=2),
             make_traj(["<answer>5</answer>"], task_id="b", group=0)]
    rewards = R.score_trajectories(trajs, {"correct": 1.0, judge: 0.1})
    assert len(ep.requests) == 2  # tasks a and b, one prompt each
    assert [t.reward_parts["group_judge"] for t in trajs] == pytest.approx([8 / 9, 3 / 9, 0.0, 3 / 9])
    assert judge.stats.parse_failures == 1  # sample 3 of task a had no line
    assert rewards[0] == pytest.approx(1 + 0.1 * 8 / 9)


def test_hybrid_example_from_the_design(endpoint_factory):
    """+1 correct (rule) + 0.1 process quality (judge) + 0.1 used the verification tool (rule)."""
    ep = endpoint_factory(lambda prompt: "Score: 10")
    judge = JudgeReward(OpenAIBackend(ep.url, model="m"))
    reward = R.combine({"correct": 1.0, judge: 0.1, "tool_use": 0.1})
    verified = make_traj([CALL, ("tool", "1000"), "<answer>1000</answer>"])
    guessed = make_traj(["<answer>1000</answer>"], group=1)
    assert reward(verified) == pytest.approx(1.2)
    assert reward(guessed) == pytest.approx(1.1)
    assert verified.reward_parts == {"correct": 1.0, "judge": 1.0, "tool_use": 1.0}


def test_unreachable_endpoint_is_an_error_not_a_crash():
    judge = JudgeReward(OpenAIBackend("http://127.0.0.1:9/v1", model="m", timeout=1.0))  # port 9: discard, closed
    assert judge(make_traj(["<answer>1000</answer>"])) == 0.0
    assert judge.stats.errors == 1


def test_tiny_model_as_local_judge_exercises_parse_failures():
    from helpers.worlds.tinymodel import load_tiny

    model, tokenizer = load_tiny()
    backend = TransformersBackend(model, tokenizer, max_new_tokens=16, timeout=20)
    reply = backend([{"role": "user", "content": "Score this: <answer>1000</answer>"}])
    assert isinstance(reply, JudgeReply) and reply.prompt_tokens > 0 and 0 < reply.completion_tokens <= 16
    judge = JudgeReward(backend)
    traj = make_traj(["<answer>1000</answer>"])
    said = backend(judge.messages(traj)).text  # greedy: the judge will get the same reply
    value = judge(traj)
    if parse_score(said) is None:  # what a 1M-parameter arithmetic model says is almost surely no score
        assert value == 0.0 and judge.stats.parse_failures == 1 and judge.failures[0]["reply"] == said[:200]
    else:
        assert value == pytest.approx((parse_score(said) - 1) / 9) and judge.stats.parse_failures == 0
    assert judge.stats.calls == 1 and judge.stats.completion_tokens > 0


# --- replies of any shape and length: a counted failure, never an exception ---------------------------


def chat_body(content, usage=None):
    return {"choices": [{"message": {"role": "assistant", "content": content}}], "usage": usage}


@pytest.mark.parametrize("body, reward, tokens", [
    (chat_body([{"type": "text", "text": "Score: "}, {"type": "text", "text": "10"}]), 1.0, (0, 0)),  # content parts: read
    (chat_body("Score: 10", {"prompt_tokens": "100", "completion_tokens": "5"}), 1.0, (100, 5)),  # counts as strings
    (chat_body("Score: 10", {"prompt_tokens": "many", "completion_tokens": -3}), 1.0, (0, 0)),  # junk counts: 0
    (chat_body("Score: 10", "usage"), 1.0, (0, 0)),
    (chat_body(None), None, (0, 0)),  # an empty reply: a parse failure
    (chat_body(7), "error", (0, 0)),  # content an int
    (chat_body({"text": "Score: 10"}), "error", (0, 0)),
    ({"choices": []}, "error", (0, 0)),
    ({"choices": "Score: 10"}, "error", (0, 0)),
    (["Score: 10"], "error", (0, 0)),
    (None, "error", (0, 0)),
    ("Score: 10", 1.0, (100, 5)),  # the usual reply (a string: FakeEndpoint wraps it)
])
def test_a_judge_reply_of_any_shape_is_scored_or_a_counted_failure(endpoint_factory, body, reward, tokens):
    ep = endpoint_factory(lambda prompt: body)
    trajs = [make_traj([f"<answer>{n}</answer>"], task_id="a", group=g) for g, n in enumerate(["1000", "1,000"])]  # two judge calls
    for judge in (JudgeReward(OpenAIBackend(ep.url, model="m")), GroupJudge(OpenAIBackend(ep.url, model="m"))):
        combined = R.combine({"correct": 1.0, judge: 1.0})
        scores = R.score_trajectories(trajs, combined)  # never raises
        if reward == "error":
            assert scores == [1.0, 1.0] and judge.stats.errors >= 1 and combined.errors == {}
            assert judge.failures[0]["kind"] == "ValueError" and "judge reply" in judge.failures[0]["reply"]
        elif reward is None or isinstance(judge, GroupJudge):  # a group judge wants `Sample i: N` lines
            assert scores == [1.0, 1.0] and judge.stats.parse_failures == 2
        else:
            assert scores == [1.0 + reward] * 2 and judge.stats.errors == 0
        if isinstance(judge, JudgeReward) and not isinstance(judge, GroupJudge):
            assert (judge.stats.prompt_tokens, judge.stats.completion_tokens) == (2 * tokens[0], 2 * tokens[1])


def test_a_backend_returning_anything_is_a_counted_failure():
    for returned in ["Score: 10", None, JudgeReply(text=7), JudgeReply("Score: 10", prompt_tokens="9", completion_tokens=None)]:
        judge = JudgeReward(lambda messages: returned)
        traj = make_traj(["<answer>1000</answer>"])
        value = judge(traj)
        if isinstance(returned, JudgeReply) and isinstance(returned.text, str):
            assert value == 1.0 and judge.stats.prompt_tokens == 9 and judge.stats.completion_tokens == 0
        else:
            assert value == 0.0 and judge.stats.errors == 1 and judge.failures[0]["kind"] == "TypeError"


@pytest.mark.parametrize("reply", [
    "score" + " " * 1_000_000 + "x",  # the cubic case: 4 s for 800 spaces before the fix
    "Score:" + " \t\n" * 300_000 + "**" + "*" * 100_000,
    "1" * 1_000_000,  # the quadratic case: 15 s for 20,000 digits
    "9." + "9" * 500_000 + " out of" + " " * 500_000 + "11",
    "Sample " + "1" * 500_000 + " " * 500_000 + ":",
    "sample 1" + " " * 1_000_000 + "= x",
    "PASS " * 200_000,
], ids=["spaces", "mixed-whitespace", "digits", "decimal", "sample-digits", "sample-spaces", "verdicts"])
def test_parsing_a_reply_is_linear_in_its_length(reply):
    start = time.perf_counter()
    parse_score(reply), parse_sample_scores(reply), parse_verdict(reply)
    assert time.perf_counter() - start < 2.0  # about 0.1 s each here


def test_parse_sample_scores():
    assert parse_sample_scores("Sample 1: 9\nsample 2 = 4.5\nSample  3 -  7\nSample 99999: 3") == {1: 9.0, 2: 4.5, 3: 7.0}
