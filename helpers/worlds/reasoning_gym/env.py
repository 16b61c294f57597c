"""ReasoningGymEnv: one reasoning-gym question, one answer, scored by the generator's own verifier.

    env = make_env("reasoning_gym", max_steps=1)           # Episode(ReasoningGymEnv())
    env.reset(task)                                        # a task of load_dataset("reasoning_gym/<generator>", ...)
    result = env.step("... <answer>4959</answer>")
    result.reward, result.info["score"], result.info["verdict"]          # 1.0, 1.0, "correct"

An environment on TRL's contract with no tools: ``reset(**row)`` keeps the task's ``generator``,
``config`` and ``entry``, and the final turn is judged by the ``_judge`` hook
(``helpers.envs.episode``) with ``score_reply``: the generator's ``score_answer`` on the last
``<answer>...</answer>``. The episode's reward is that score, partial credit included;
``info["correct"]`` is a score of 1.

The same verifier is the reward part ``"reasoning_gym"`` (``verifier_reward``), which a preset
names (``rewards={"reasoning_gym": 1.0}``): it reads the task's row and the completion, so it
scores TRL's completions too, where the env never sees the final text. And the world registers the
benchmark ``reasoning_gym`` (``python -m helpers.evaluate --benchmark reasoning_gym/<generator>``),
whose answers file holds one ``{"task_id", "completion"}`` per line, the completion being the reply.

Simplification, named: the verifier runs in this process without a timer, as the adapter's
final-turn judging does (``helpers.envs.episode``): reasoning-gym's verifiers are Python code
written for answers of a few hundred characters, and a few of them parse the answer with sympy.
"""

from __future__ import annotations

from helpers.envs import CalculatorEnv
from helpers.envs.anchors import register_anchor, tool_history
from helpers.envs.registry import register_env
from helpers.benchmarks import Benchmark, register_benchmark
from helpers.rewards import register_reward
from helpers.worlds.reasoning_gym.tasks import score_reply


class ReasoningGymEnv:
    """Single turn (no tools; ``ReasoningGymCalculatorEnv`` below adds the calculator): the first assistant turn is the answer, judged by the task's generator."""

    def __init__(self):
        self.generator, self.config, self.entry = "", {}, {}

    def reset(self, **row) -> None:
        """Keep what the verifier needs: the row's ``generator``, ``config`` and ``entry``."""
        missing = [key for key in ("generator", "config", "entry") if key not in row]
        if missing:
            raise ValueError(f"ReasoningGymEnv needs a task of a reasoning_gym/<generator> dataset; the row has no {missing}")
        self.generator, self.config, self.entry = row["generator"], row["config"], row["entry"]
        return None

    def _judge(self, text: str) -> dict:
        """The final turn: ``score_reply``'s keys, and its score as the reward. A verifier that raises on
        this answer scores 0 with verdict ``"verifier_error"`` (the reason in ``info["error"]``)."""
        try:
            judged = score_reply(text, self.generator, self.config, self.entry)
        except Exception as e:  # the package's bug on an odd answer must not stop the rollout
            return {"verdict": "verifier_error", "correct": False, "score": 0.0, "error": f"{type(e).__name__}: {e}"[:300], "reward": 0.0}
        return {**judged, "reward": judged["score"]}


class ReasoningGymCalculatorEnv(ReasoningGymEnv, CalculatorEnv):
    """A reasoning-gym question with the calculator as a tool: ``ReasoningGymEnv``'s reset and judging (the
    generator's verifier on the last ``<answer>``), ``CalculatorEnv``'s ``calculator(expression)``. The
    arithmetic generators (``products``, ``basic_arithmetic``) become the one-call world's kind of task,
    judged by reasoning-gym: what the tiny market mixes (``helpers.worlds.market``)."""


register_env("reasoning_gym", ReasoningGymEnv)
register_env("reasoning_gym_calculator", ReasoningGymCalculatorEnv)
for _name in ("reasoning_gym", "reasoning_gym_calculator"):  # the answers and calls so far and what came back: the state
    register_anchor(_name, tool_history)


@register_reward("reasoning_gym")
def verifier_reward(traj) -> float:
    """The generator's own ``score_answer`` on the completion's last ``<answer>`` (``score_reply``), in [0, 1].

    Gamed by: whatever the generator's verifier lets through. The arithmetic verifiers (the base
    class's default, and ``compute_decimal_reward``, which ``chain_sum`` and ``products`` use) pay
    ``len(oracle) / len(answer)`` when the oracle is a substring of the answer: "4959" inside "49591"
    earns 0.8, and an answer that lists candidates ("7 3037 8") still earns a part (0.5).
    """
    return score_reply(traj.completion_text, **traj.task.metadata)["score"]


def judge_output(task, output: str) -> dict:
    """One line of an answers file: ``output`` is the model's reply, judged as the env judges it."""
    return score_reply(output, **task.metadata)


register_benchmark("reasoning_gym", Benchmark(
    env="reasoning_gym",
    judge=judge_output,
    answers_format='{"task_id": ..., "completion": the reply, with its <answer>...</answer>}',
    max_steps=1,
    max_new_tokens=512,
    max_total_tokens=2048,
))
