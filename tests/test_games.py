"""Tests for helpers.worlds.games (game, env, tasks, strength, collect, build) and ``helpers.evaluate --opponent``:
Kuhn poker's rules and text, forfeits by name, the exact measures against OpenSpiel's known values, the
role-conditioned advantages by hand, the collector's hands, a short run of both modes."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("pyspiel", reason="the game world needs OpenSpiel (the games extra)")

from helpers.config import get_preset  # noqa: E402
from helpers.data import load_dataset  # noqa: E402
from helpers.envs import make_env  # noqa: E402
from helpers.health import check_health, window_noise  # noqa: E402
from helpers.live import LiveCurves  # noqa: E402
from helpers.paths import ROOT  # noqa: E402
from helpers.policy import HFPolicy  # noqa: E402
from helpers.train import train  # noqa: E402
from helpers.worlds.games.build import GAMES_DIR, baseline, demonstrations, demonstrator, keep  # noqa: E402
from helpers.worlds.games.collect import UNIFORM, Hands, play_hands, rae_advantages, update_baselines  # noqa: E402
from helpers.worlds.games.env import load_opponent, match_report  # noqa: E402
from helpers.worlds.games.game import ILLEGAL_PENALTY, Match, conversation, information_states, observation_for, parse_move  # noqa: E402
from helpers.worlds.games.strength import best_response, exploitability, head_to_head, move_table, table_from_bets  # noqa: E402
from helpers.worlds.tinymodel import load_tiny  # noqa: E402


def test_kuhn_rules_payoffs_and_text():
    m = Match((0, 2))  # player 1 J, player 2 K
    assert m.observation(0) == "Your card: J. You are player 1. Moves so far: none. Legal moves: pass (check), bet."
    assert m.play("<answer>bet</answer>") and m.to_move == 1 and not m.done
    assert m.observation(1) == "Your card: K. You are player 2. Moves so far: bet. Legal moves: pass (fold), bet (call)."
    assert m.play("<answer> Bet </answer>") and m.done and m.returns() == [-2.0, 2.0]  # called: K wins the pot of 4
    m = Match((2, 1))
    m.play_move("pass"), m.play_move("bet"), m.play_move("pass")  # player 1 folds the K
    assert m.done and m.returns() == [-1.0, 1.0] and m.history == "pbp"
    assert parse_move("bet") is None and parse_move("<answer>raise</answer>") is None and parse_move("<answer>pass</answer>") == "pass"
    with pytest.raises(ValueError):
        Match((1, 1))


def test_an_illegal_move_forfeits_by_name():
    m = Match((2, 0))
    assert not m.play("I bet everything") and m.done and m.forfeited == 0
    assert m.returns() == [-ILLEGAL_PENALTY, ILLEGAL_PENALTY]  # zero-sum still


def test_conversation_replays_the_seats_own_moves():
    keys = information_states()
    assert len(keys) == 12 and {k[1:] for k in keys} == {"", "p", "b", "pb"}
    messages = conversation("0pb")  # player 1, J, passed, then faced a bet
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == "<answer>pass</answer>" and messages[3]["content"] == observation_for("0pb")
    assert [m["role"] for m in conversation("1b")] == ["system", "user"]


def test_exact_measures_match_openspiel_known_values():
    assert exploitability(UNIFORM) == pytest.approx(0.458333, abs=1e-6)  # FINDINGS.md: OpenSpiel's uniform policy
    # A Nash equilibrium (alpha = 0): exploitability 0, and player 1 loses 1/18 per hand, so seats balanced it is 0 vs itself.
    nash = table_from_bets({"0": 0, "1": 0, "2": 0, "0pb": 0, "1pb": 1 / 3, "2pb": 1, "0p": 1 / 3, "1p": 0, "2p": 1, "0b": 0, "1b": 1 / 3, "2b": 1})
    assert exploitability(nash) == pytest.approx(0.0, abs=1e-9)
    weak = demonstrator()
    assert exploitability(weak) == pytest.approx(0.27, abs=1e-5)
    assert head_to_head(nash, weak) > 0 and head_to_head(nash, weak) == pytest.approx(-head_to_head(weak, nash))
    assert head_to_head(weak, weak) == pytest.approx(0.0, abs=1e-12)


def test_role_conditioned_advantages_by_hand():
    # The worked example of helpers/worlds/games/__init__.py: two hands, decay 0.95, both baselines start at 0.
    # SPIRAL: each game's baseline is read first (that game's moves subtract it), then updated with the game's return.
    read, after = update_baselines({}, [(0, -2.0), (1, 2.0), (0, 1.0), (1, -1.0)], 0.95)
    assert read == pytest.approx([0.0, 0.0, -0.10, 0.10])
    assert after == pytest.approx({"kuhn_poker/seat0": -0.045, "kuhn_poker/seat1": 0.045})
    chips = [-2.0, 2.0, 1.0, -1.0]
    adv = rae_advantages(chips, read)
    assert adv.advantages.shape == (4, 1)
    assert torch.allclose(adv.advantages.flatten(), torch.tensor([-2.0, 2.0, 1.1, -1.1]))
    assert torch.equal(rae_advantages(chips, None).advantages.flatten(), torch.tensor(chips))  # no RAE: A = R
    assert update_baselines(after, [(0, 1.0)], 0.95)[1]["kuhn_poker/seat1"] == pytest.approx(0.045)  # a seat without a game keeps its baseline


def test_a_seat_that_moves_twice_updates_its_baseline_once():
    # Player 1 (J) passes, player 2 (K) bets, player 1 folds: player 1 moved twice, player 2 once, in one hand.
    match = Match((0, 2))
    for move in ("pass", "bet", "pass"):
        match.play_move(move)
    moves = [SimpleNamespace(task_id=f"hand-1-0-{turn}", reward=match.returns()[seat]) for turn, seat in enumerate((0, 1, 0))]
    hands = Hands([match], moves, [0, 1, 0], [None])
    assert hands.returns == [(0, -1.0), (1, 1.0)]  # one return per seat and hand, not one per move
    read, after = update_baselines({"kuhn_poker/seat0": 0.2}, hands.returns, 0.95)
    assert after["kuhn_poker/seat0"] == pytest.approx(0.95 * 0.2 + 0.05 * -1.0)
    of = dict(zip(hands.trained, read))
    assert [of[k] for k in hands.keys] == [0.2, 0.0, 0.2]  # both of player 1's moves subtract the baseline read before the hand
    control = Hands([match], [moves[1]], [1], [1])  # the control: the policy sat in seat 2 only
    assert control.returns == [(1, 1.0)]  # only the policy's seat learns a baseline


def test_env_hand_against_plug_in_opponents():
    env = make_env("kuhn_poker", max_steps=2)
    tasks = load_dataset("kuhn_poker", "test", 12)
    assert [t.metadata["seat"] for t in tasks[:4]] == [0, 1, 0, 1] and len({tuple(t.metadata["deal"]) for t in tasks}) == 6

    def always(move):
        return lambda observation, legal_moves: move

    def raises(observation, legal_moves):
        raise RuntimeError("opponent bug")

    task = tasks[0]  # deal (0, 1): the policy is player 1 with J
    env.reset(task.__class__(task.id, task.prompt, None, {**task.metadata, "opponent": always("bet")}))
    step = env.step("<answer>pass</answer>")  # the opponent bets; the policy must answer again
    assert not step.done and step.observation[0]["content"].endswith("Moves so far: pass, bet. Legal moves: pass (fold), bet (call).")
    step = env.step("<answer>pass</answer>")
    assert step.done and step.reward == -1.0 and step.info["verdict"] == "lost"
    for opponent, verdict, reward in [(raises, "opponent_error", ILLEGAL_PENALTY), (always("fold"), "opponent_illegal", ILLEGAL_PENALTY),
                                      (always(None), "opponent_illegal", ILLEGAL_PENALTY)]:
        env.reset(task.__class__(task.id, task.prompt, None, {**task.metadata, "seat": 1, "opponent": opponent}))  # the opponent moves first
        step = env.step("<answer>bet</answer>")
        assert step.done and step.info["verdict"] == verdict and step.reward == reward
    env.reset(task)
    step = env.step("all in")
    assert step.done and step.info["verdict"] == "illegal_move" and step.reward == -ILLEGAL_PENALTY
    with pytest.raises(ValueError):
        load_opponent("no_colon_here")


def test_warm_start_table_is_the_shipped_baseline():
    model, tokenizer = load_tiny(GAMES_DIR)
    shipped = json.loads((GAMES_DIR / "baseline.json").read_text())
    measured = baseline(model, tokenizer)
    assert measured["exploitability"] == pytest.approx(shipped["exploitability"], abs=1e-3)
    assert measured["illegal"] < 0.01 and measured["max_gap_to_demonstrator"] < 0.1  # it imitates the weak player
    bet = measured["bet"]  # ... and, like it, reads the betting: it folds a J to a bet far more often than it bluffs with one
    assert bet["0b"] < bet["0"] - 0.15 and bet["0pb"] < bet["0"] - 0.15 and bet["1b"] < bet["1"] - 0.15
    assert len(demonstrations(3, 0)) == 6  # one example per seat per hand


def test_play_hands_self_play_and_control():
    model, tokenizer = load_tiny(GAMES_DIR)
    policy = HFPolicy(model, tokenizer)
    config = get_preset("tiny-kuhn", hands_per_step=6)
    hands = play_hands(policy, config, step=1)
    assert len(hands.matches) == 6 and all(m.done for m in hands.matches) and set(hands.seats) == {0, 1}
    for m in hands.matches:
        assert sum(m.returns()) == 0  # zero-sum
    assert all(t.reward in (-2.0, -1.0, 1.0, 2.0) for t in hands.moves)
    table = move_table(model, tokenizer)
    control = play_hands(policy, config, step=1, opponent_table=table)
    assert len(control.matches) == 12 and control.learner[:2] == [0, 1]
    hand_of = [int(t.task_id.split("-")[2]) for t in control.moves]
    assert all(seat == control.learner[h] for seat, h in zip(control.seats, hand_of))  # only the policy's seat is trained


@pytest.mark.parametrize("opponent", ["self", "warm", "pool"])
def test_short_run_logs_exact_strength(tmp_path, opponent):
    config = get_preset("tiny-kuhn", steps=2, hands_per_step=4, eval_tasks=12, eval_every=0, save_every=0, opponent=opponent, pool_every=1,
                        out_dir=str(tmp_path / "run"))
    result = train(config, preset_name="tiny-kuhn", live=LiveCurves(tmp_path, total_steps=2))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    s = summary["strength"]
    assert summary["opponent"] == opponent and s["curve"]["step"] == [0, 1, 2]
    assert s["curve"]["exploitability"][0] == pytest.approx(s["before"]["exploitability"], abs=1e-4)
    assert s["before"]["vs_warm"] == 0 and 0 < s["after"]["exploitability"] < 0.5
    assert set(summary["tables"]["after"]) == set(information_states())
    assert result.history[1]["game/moves"] > 0 and "rae/baseline_seat0" in result.history[1]


PLAYER = '''
def always_bet(observation, legal_moves):
    return "bet"

def broken(observation, legal_moves):
    raise ValueError("a bug in the plug-in")
'''


@pytest.mark.parametrize("function, counted", [("always_bet", None), ("broken", "opponent_error")])
def test_evaluate_plays_a_plug_in_opponent(tmp_path, function, counted):
    (tmp_path / "my_player.py").write_text(PLAYER)  # imports nothing from helpers
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
                          "from helpers.evaluate import main; main(sys.argv[1:])",
                          "--preset", "tiny-kuhn", "--opponent", f"my_player:{function}", "--n", "24", "--temperature", "1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["hands"] == 24 and line["wins"] + line["draws"] + line["losses"] == 24
    assert 0 < line["exploitability"] < 0.5
    if counted:
        assert line[counted] == 24 and line["wins"] == 24  # every hand forfeited by the opponent, none crashed


def test_match_report_counts_outcomes():
    class T:
        def __init__(self, chips, verdict):
            self.info = {"chips": chips, "verdict": verdict}

    report = match_report([T(1.0, "won"), T(-2.0, "illegal_move"), T(2.0, "opponent_error"), T(0.0, None)])
    assert (report["wins"], report["draws"], report["losses"], report["illegal_move"], report["opponent_error"]) == (2, 1, 1, 1, 1)


# The control's step rewards (chips per move against the warm start, seed 0, 40 steps): mean near 0, noise of
# tenths of a chip from a few dozen hands. The exact value against the warm start rose at every step of that run.
CONTROL_REWARDS = [-0.15, -0.11, -0.18, -0.36, -0.26, 0.03, -0.06, -0.5, -0.3, -0.17, 0.29, -0.21, -0.35, 0.09, -0.18, -0.11, -0.06,
                   0.25, 0.06, 0.35, -0.09, 0.12, 0.0, -0.17, -0.58, -0.06, 0.0, -0.11, -0.03, -0.25, -0.2, 0.0, 0.59, 0.06, 0.34,
                   -0.11, 0.33, 0.03, 0.38, -0.29]


def test_reward_collapse_is_not_the_luck_of_a_games_small_batches():
    def warned(rewards):
        history = [{"step": s, "reward": r, "kl": 0.01, "entropy": 0.3} for s, r in enumerate(rewards, 1)]
        return [s for s in range(1, len(history) + 1) if "reward_collapse" in dict(check_health(history[:s]))]

    assert warned(CONTROL_REWARDS) == []  # the best 3-step mean was luck; later ones at half of it are too
    # A real collapse at the same noise: the same steps, but the last ten a chip lower.
    collapsed = CONTROL_REWARDS[:30] + [r - 1.0 for r in CONTROL_REWARDS[30:]]
    assert warned(collapsed) and warned(collapsed)[0] > 30
    assert window_noise(CONTROL_REWARDS, 3) > 0.15  # the steps' own noise, in chips


def test_best_response_wins_the_exploitability():
    for table in (demonstrator(), UNIFORM):
        br = best_response(table)
        assert set(br) == set(information_states()) and all(row["bet"] in (0.0, 1.0) for row in br.values())  # pure
        assert head_to_head(br, table) == pytest.approx(exploitability(table), abs=1e-9)  # a best response wins exactly that
    assert exploitability(best_response(demonstrator())) > exploitability(demonstrator())  # exploiting one player is exploitable


def test_keep_trims_a_run(tmp_path):
    config = get_preset("tiny-kuhn", steps=1, hands_per_step=2, eval_tasks=6, save_every=0, log_trajectories_every=0, out_dir=str(tmp_path / "run"))
    train(config, preset_name="tiny-kuhn", live=LiveCurves(tmp_path, total_steps=1))
    kept = keep(tmp_path / "run", "python -m helpers.train --preset tiny-kuhn --steps 1")
    assert kept["command"].endswith("--steps 1") and kept["strength"]["curve"]["step"] == [0, 1] and len(kept["reward"]) == len(kept["kl"]) == 1
    assert set(kept["tables"]["after"]) == set(information_states()) and set(kept["eval"]["after"]) == {"success", "pass@1"}
